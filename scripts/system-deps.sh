#!/usr/bin/env bash
# Debian packages the demo and tests need: fonts for the generated sample memes (Latin: DejaVu,
# Chinese: WenQuanYi Micro Hei) and headless Chromium for the /ops page test.
# Installs only what is missing; a no-op on a machine that has them.
set -euo pipefail
need=()
for pkg in fonts-dejavu-core fonts-wqy-microhei chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "please install: ${need[*]} (apt-get install)" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
