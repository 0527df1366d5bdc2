# memeflow image for the distributed deployment (docker-compose.yml): one image, one command per
# container (api, worker --lane X, beat, flower, db upgrade). Nothing embedded runs here:
# MEMEFLOW_DATABASE_URL and MEMEFLOW_BROKER_URL point at the postgres and redis services.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    MEMEFLOW_VAR_DIR=/data/var \
    MEMEFLOW_STORAGE_DIR=/data/storage

# libgl1/libglib2.0-0: OpenCV (rapidocr); fonts: `memeflow demo` sample generation; curl: healthchecks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 fonts-dejavu-core fonts-wqy-microhei curl \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 memeflow \
 && mkdir -p /data/var /data/storage && chown -R memeflow:memeflow /data
WORKDIR /srv/memeflow

# Dependencies first (cached layer), then the code.
COPY setup.cfg pyproject.toml README.md ./
COPY app/__init__.py app/__init__.py
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -e '.[ml]'
COPY . .
RUN pip install --no-deps -e .

USER memeflow
EXPOSE 5000 5555
CMD ["memeflow", "--help"]
