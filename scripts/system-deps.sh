#!/usr/bin/env bash
# Installs the Debian packages the integration tests start locally (RabbitMQ, Mosquitto, wrk)
# and the headless browser the admin page test drives (Chromium and its chromedriver).
# Does nothing when they are present; needs root (or sudo) when something is missing.
set -euo pipefail
packages=(rabbitmq-server mosquitto wrk chromium chromium-driver)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian package may start a system-wide node; the tests run their own private nodes.
$sudo service rabbitmq-server stop >/dev/null 2>&1 || true
$sudo service mosquitto stop >/dev/null 2>&1 || true
