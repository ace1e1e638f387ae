"""One contract per serving engine: every instance key that becomes a flag of the engine, in one
table, and what is made from it (the entry form, the command line, the flags extra_args may not
give again, what the tuner sweeps, the docs). Standard library only: the programs that run on
hosts (rigup/tune.py) ship the table with them, and tests/gpu loads it with a plain python3.

- ``llama_server``: llama.cpp's llama-server (roles/llama_server)
"""
