#!/usr/bin/env bash
# Install bubblewrap (bwrap), the preferred sandbox of rspo/rewards/sandbox/__init__.py (quiet, idempotent;
# without root or apt it says why and exits 0: the code reward then falls back to `unshare --net`
# or rlimits only; see `python -c "from rspo.rewards.sandbox import sandbox_backend;
# print(sandbox_backend())"`).
exec bash "$(dirname "$0")/apt_install.sh" install_sandbox bwrap bubblewrap \
    "the code sandbox will use a weaker fallback"
