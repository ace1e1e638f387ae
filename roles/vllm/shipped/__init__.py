"""What roles/vllm installs on hosts (ray_wait.py: standard library and Ray's own client, in Ray's venv: docs/layout.md, "Programs that run on hosts")."""
