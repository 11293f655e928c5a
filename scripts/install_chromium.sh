#!/usr/bin/env bash
# Install headless Chromium for the MLflow UI check (tests/test_mlflow_ui.py): quiet and
# idempotent; without root or apt it says why and exits 0 (the browser test then skips, naming
# the reason). Set CHROMIUM to use another binary.
exec bash "$(dirname "$0")/apt_install.sh" install_chromium "${CHROMIUM:-chromium}" chromium
