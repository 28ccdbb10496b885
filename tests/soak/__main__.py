"""``python -m tests.soak``: see :mod:`tests.soak.run`."""

from tests.soak.run import main

main()
