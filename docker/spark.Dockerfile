# Spark for the bridge: a standalone master or worker of the pyspark wheel (Spark 4, which
# has the Python Data Source API the bridge needs; Spark 3.5 images have not), a Debian
# Java 17 runtime, and wsnmom with the spark extra, so the executors' Python workers can
# import the bridge.  Used by the `spark` profile of docker/compose.yml.
#
#   docker build -f docker/spark.Dockerfile -t wsnmom-spark .    (from the repository root)

# --- build: a wheel of the project -------------------------------------------------------
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY topic_mapping/ topic_mapping/
COPY soap_frontend/ soap_frontend/
COPY adapters/ adapters/
COPY wsnmom/ wsnmom/
COPY spark_bridge/ spark_bridge/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- runtime: Java 17 + pyspark + wsnmom[spark] ---------------------------------------------
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/wsnmom/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels/ /wheels/
RUN python -m venv /opt/wsnmom \
    && WHEEL="$(ls /wheels/wsnmom-*.whl)" \
    && /opt/wsnmom/bin/pip install --no-cache-dir "${WHEEL}[spark]" \
    && rm -rf /wheels \
    && useradd --system --uid 10002 --create-home --home-dir /home/spark --shell /usr/sbin/nologin spark \
    && mkdir -p /srv/spark \
    && chown spark:spark /srv/spark
COPY examples/ /opt/wsnmom/examples/
# the pyspark wheel is a whole Spark distribution (bin/spark-class, jars/)
ENV SPARK_HOME=/opt/wsnmom/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/wsnmom/bin/python \
    SPARK_NO_DAEMONIZE=true \
    SPARK_WORKER_DIR=/home/spark/work
# checkpoints and state stores: the compose profile mounts one volume here on every node
VOLUME ["/srv/spark"]
USER spark:spark
WORKDIR /home/spark
