"""What roles/burnin installs on hosts (standard library only: docs/layout.md, "Programs that run on hosts")."""
