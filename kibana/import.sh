#!/bin/sh
# Imports the llmgate saved objects into Kibana: the data view, four saved searches and the
# dashboard, with fixed ids, overwriting earlier versions. Retries until Kibana answers.
#   KIBANA_URL=http://localhost:5601 KIBANA_USER=elastic KIBANA_PASSWORD=... kibana/import.sh kibana/saved_objects.ndjson
set -eu
file="${1:-kibana/saved_objects.ndjson}"
url="${KIBANA_URL:-http://localhost:5601}"
for attempt in $(seq 1 60); do
    if answer=$(curl -fsS -u "${KIBANA_USER:-elastic}:${KIBANA_PASSWORD:?set KIBANA_PASSWORD}" \
            -X POST "$url/api/saved_objects/_import?overwrite=true" \
            -H "kbn-xsrf: true" --form "file=@$file"); then
        case "$answer" in
            *'"success":true'*) echo "kibana: imported $(grep -c '' "$file") saved objects"; exit 0 ;;
            *) echo "kibana: the import failed: $answer" >&2; exit 1 ;;
        esac
    fi
    echo "kibana: not ready (attempt $attempt), retrying in 5 s" >&2
    sleep 5
done
exit 1
