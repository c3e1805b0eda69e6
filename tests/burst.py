"""Drop COUNT messages across the given boxes as fast as possible, in a separate process.

python burst.py MAIL_ROOT COUNT HANDLE... ; prints the number written when done.
"""

import random
import sys
from pathlib import Path

from courier import mailbox

root, count, handles = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
rng = random.Random(7)
for i in range(count):
    mailbox.drop_message(root, rng.choice(handles), sender="burst", subject=f"m{i}", body=f"body {i}")
print(count, flush=True)
