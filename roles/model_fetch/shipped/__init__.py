"""What roles/model_fetch installs on hosts (standard library only: docs/layout.md, "Programs that run on hosts")."""
