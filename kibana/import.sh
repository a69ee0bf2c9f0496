#!/bin/sh
# Imports the llmgate saved objects into Kibana: the data view, four saved searches and the
# dashboard, with fixed ids, overwriting earlier versions. Retries until Kibana answers.
#   KIBANA_URL=http://localhost:5601 KIBANA_USER=elastic KIBANA_PASSWORD=... kibana/import.sh kibana/saved_objects.ndjson
#   KIBANA_PASSWORD_FILE=docker/secrets/elastic_password kibana/import.sh
# The user defaults to elastic: the import needs Kibana feature privileges (saved objects
# management, all on data views, Discover and dashboards), which only Kibana's own role
# API sets. The password reaches curl on its standard input (`-K -`), never its command
# line, which any user of the host can read in `ps`.
set -eu
file="${1:-kibana/saved_objects.ndjson}"
url="${KIBANA_URL:-http://localhost:5601}"
user="${KIBANA_USER:-elastic}"
pause="${RETRY_SECONDS:-5}"
if [ -n "${KIBANA_PASSWORD_FILE:-}" ]; then
    password=$(cat "$KIBANA_PASSWORD_FILE")
else
    password="${KIBANA_PASSWORD:?set KIBANA_PASSWORD or KIBANA_PASSWORD_FILE}"
fi
newline='
'
case "$user:$password" in
    *"$newline"*) echo "kibana: the user or password holds a line break, which curl's configuration cannot" >&2; exit 1 ;;
esac
# curl's configuration syntax: inside double quotes, \ and " are escaped with a \.
credentials=$(printf '%s' "$user:$password" | sed 's/[\\"]/\\&/g')
for attempt in $(seq 1 60); do
    if answer=$(printf 'user = "%s"\n' "$credentials" |
            curl -fsS -K - -X POST "$url/api/saved_objects/_import?overwrite=true" \
            -H "kbn-xsrf: true" --form "file=@$file"); then
        case "$answer" in
            *'"success":true'*) echo "kibana: imported $(grep -c '' "$file") saved objects"; exit 0 ;;
            *) echo "kibana: the import failed: $answer" >&2; exit 1 ;;
        esac
    fi
    echo "kibana: not ready (attempt $attempt), retrying in $pause s" >&2
    sleep "$pause"
done
exit 1
