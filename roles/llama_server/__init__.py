"""roles/llama_server: one llama-server systemd unit per instance, health-checked.

Implemented by issue 6; preflight reads its variables (roles/llama_server/defaults.yml):
llama_server_instances. The form of each instance is roles/preflight/schema.py LLAMA_INSTANCE.
"""
