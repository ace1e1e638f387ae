"""What the plays send to hosts (standard library only: docs/layout.md, "Programs that run on hosts")."""
