"""mmrun.models.wan: Wan2.1 video generation written once against mmrun.backend (diffusers' names)."""
