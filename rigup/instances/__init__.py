"""The serving engines' instances as every reader reads them: each engine's entry form made from
its contract's rows (rigup/contract/), the rules its values follow, and ``instances(data)``, the
host's entries normalised (every key, its default filled in), tuned and checked, with problems by
key path. The engines' roles (roles/llama_server, roles/vllm), rigup/serving.py's plan and the
readers beyond them (the metrics, the watchdog, rigup/rpc.py, rigup/bench.py: llama-server's
``normalised``) read the one shape from here, so no reader imports a role.

- ``llama_server``: ``llama_server_instances`` (:class:`~rigup.instances.llama_server.LlamaInstance`)
- ``tuned``: ``llama_server_tuned``, the flags tune.py measured, laid over the instances
- ``vllm``: ``vllm_instances`` (:class:`~rigup.instances.vllm.VllmInstance`)

Not shipped to hosts (the contracts are: rigup/tuning.py), so not bound to the standard library.
"""
