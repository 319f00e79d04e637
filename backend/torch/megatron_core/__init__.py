"""megatron-core imported for this device (torch only): the ground floor of the megatron-core engine, which
lives in engines/torch/megatron_core/ (it builds models and knows the trainer; this folder knows neither).

Not part of the portable backend face: MindSpore has no megatron-core, so this package has no twin in
`mmrun.backend.mindspore` (tests/backend_api/test_backend_face.py compares only the modules outside
each backend's FRAMEWORK_ONLY set).

- runtime.py          megatron-core imported for this device (shims on CPU only, transfer_to_npu on NPU)
- cpu_shims.py        every CPU shim megatron-core needs, each with its reason
"""
