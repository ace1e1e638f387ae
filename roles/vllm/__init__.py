"""roles/vllm: one vLLM server systemd unit per instance, health-checked.

Implemented by issue 6; preflight reads its variables (roles/vllm/defaults.yml): vllm_instances.
The form of each instance is roles/preflight/schema.py VLLM_INSTANCE.
"""
