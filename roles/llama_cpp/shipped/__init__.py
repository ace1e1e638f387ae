"""What roles/llama_cpp installs on hosts (standard library only: docs/layout.md, "Programs that run on hosts")."""
