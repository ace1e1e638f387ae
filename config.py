"""pyinfra's configuration for every play of rigup (pyinfra reads config.py from the directory it
runs in).

TEMP_DIR: where pyinfra uploads a file first when it then moves it into place with sudo (hosts
reached as a login user with ``_sudo``, as inventory/a100.py's). pyinfra's default is the host's
$TMPDIR or /tmp, under a name anyone can predict (``pyinfra-<sha1 of the destination>``,
pyinfra/api/host.py get_temp_filename), where another local user could plant a file or a link
first and have root move their content into /etc (issue 47). "." is the login user's home on the
host, the directory SFTP and the shell start in, which only that user (and root) can write; a host
reached as root (the lab) uploads straight to the destination.
"""

from pyinfra import config

config.TEMP_DIR = "."
