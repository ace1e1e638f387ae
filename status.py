"""Where each host's model downloads are: bytes, %, rate, ETA, or complete. Changes nothing.

    pyinfra inventory/lab.py status.py
"""

from pyinfra import host

from roles import model_fetch
from rigup.config import check_host

check_host(host)
model_fetch.status()
