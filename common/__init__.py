"""mmrun.common: small framework-free pieces every room of the house uses (atomic writes, YAML tables)."""
