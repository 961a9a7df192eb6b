"""A plain torchrun script that fails unless its TMPDIR, and the job's temporary folder around it,
are this user's own and private; then it leaves a file there, as libraries do."""

import os
import stat
import sys
import tempfile

node_tmp = tempfile.gettempdir()
for folder in (node_tmp, os.path.dirname(node_tmp)):
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700:
        sys.exit(f"{folder}: uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}: not this user's private folder")
with open(os.path.join(node_tmp, f"left-by-rank-{os.environ['RANK']}"), "w") as handle:
    handle.write(node_tmp)
print(f"TMPDIR {node_tmp}", flush=True)
