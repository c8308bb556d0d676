#!/usr/bin/env bash
# Installs the Debian packages the integration tests start locally (RabbitMQ, Mosquitto,
# PostgreSQL, HAProxy, wrk), the headless browser the admin page test drives (Chromium and its
# chromedriver), and a Java runtime for the Spark bridge's tests (PySpark 4 needs Java 17 or 21).
# Does nothing when they are present; needs root (or sudo) when something is missing.
set -euo pipefail
packages=(rabbitmq-server mosquitto postgresql haproxy wrk chromium chromium-driver)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# any Java 17+ on PATH will do; otherwise the distribution's default headless JRE
# (17 on Debian 12, 21 on Debian 13)
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1 || true)
if [[ -z "$java_major" || "$java_major" -lt 17 ]]; then
  missing+=(default-jre-headless)
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian package may start a system-wide node; the tests run their own private nodes.
$sudo service rabbitmq-server stop >/dev/null 2>&1 || true
$sudo service mosquitto stop >/dev/null 2>&1 || true
$sudo service postgresql stop >/dev/null 2>&1 || true
$sudo service haproxy stop >/dev/null 2>&1 || true
