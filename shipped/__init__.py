"""The modules several owners install beside their host programs (each as ``rigup_NAME.py``, read by
the program's ``beside``): ``xid`` (Xid lines read and classified: the guard, rigup-burnin),
``throughput`` (one measured completion: the watchdog, the metrics relay, the sweep, bench.py's
script) and ``gguf`` (a GGUF header's figures: the sweep; the controller reads models with it too).
Standard library only, importing nothing of the tree: the ground floor (docs/layout.md). Shipped by
rigup/files.py ``program`` and ``program_text``, as every file of a ``shipped/`` folder is."""
