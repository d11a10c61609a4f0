"""README's mori_rs.io example runs as written (the first python block of README.md)."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")


def test_readme_io_example_runs():
    with open(README) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert blocks and "mori_rs.io" in blocks[0]
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('decode-0', b'req-1')", out.stdout
