"""verde_chain: verifiable delegated machine learning on an EVM chain (README.md)."""

import time

# When the package was first imported: the demo's report counts the imports from here on, so the
# wall time it prints is the command's and its parts add up.
IMPORTED_AT = time.monotonic()
