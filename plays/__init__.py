"""The engines of the top-level plays (status.py, shards.py, roll.py, bench.py, tune.py): code only a
play needs. rigup/ is the roles' library and never imports from here; roles never import from here
(tests/unit/test_layout.py holds both).

- ``fleet``: status.py's and shards.py's report: what each host runs and what is wrong, its row, the table and JSON
- ``roll``: roll.py's (and shards.py's) hosts, batches, limits and journal of the roll in progress
- ``inventory``: roll.py's and shards.py's reader of an inventory file into pyinfra's ``Inventory``
- ``bench``: bench.py's facts (the throughput sweep, llama-bench, the serving markers) and its reports
- ``tuning``: tune.py's sweep spec, its job on the host, the installed unit compared, the result kept
- ``charts``: bench.py's and tune.py's charts, the only code that imports matplotlib
- ``shipped``: what the plays send to hosts: ``tune``, the flag sweep (tune.py installs it as
  rigup_tune.py, with shipped/throughput.py and shipped/gguf.py beside it)
"""
