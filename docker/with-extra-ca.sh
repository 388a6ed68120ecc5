#!/bin/sh
# Run a command that downloads, trusting one extra CA certificate when the build was given one.
#
#     RUN --mount=type=secret,id=extra_ca,required=false with-extra-ca pip install ...
#
# Behind a TLS-inspecting proxy pip fails with CERTIFICATE_VERIFY_FAILED unless it trusts the
# proxy's CA. The certificate comes in as the optional build secret `extra_ca`, so it is never
# stored in a layer; without it the command runs unchanged. The combined bundle lives in a
# temporary file that is removed when the command ends, so nothing of it stays in the image.
set -eu

secret=/run/secrets/extra_ca
if [ ! -s "$secret" ]; then
    exec "$@"
fi

bundle=$(mktemp)
trap 'rm -f "$bundle"' EXIT
# Added to the usual roots, not substituted for them: hosts outside the proxy must still verify.
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
    cat /etc/ssl/certs/ca-certificates.crt >"$bundle"
fi
cat "$secret" >>"$bundle"
# pip reads PIP_CERT; Python's ssl module and requests read the other two (pip download in
# build_horovod.py, torchvision downloads); curl reads CURL_CA_BUNDLE.
PIP_CERT=$bundle SSL_CERT_FILE=$bundle REQUESTS_CA_BUNDLE=$bundle CURL_CA_BUNDLE=$bundle "$@"
