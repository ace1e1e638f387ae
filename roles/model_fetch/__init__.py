"""roles/model_fetch: download pinned model weights (hf download --revision --include).

Implemented by issue 5; preflight reads its variables (roles/model_fetch/defaults.yml):
models_dir, models. The form of each entry of `models` is roles/preflight/schema.py MODEL.
"""
