#!/usr/bin/env bash
# The one-shot es-setup service of docker/compose.yaml: the users the stack logs in to
# Elasticsearch as, made with the security API as the elastic superuser.
#
# 1. kibana_system (built in) gets its password: Kibana's server connects as it.
# 2. The role llmgate_semlog (docker/llmgate-es-role.json): exactly what the gateway's
#    semantic log calls (docs/operations.md has the table, API by API).
# 3. The user llmgate with that role only: the gateway writes as it, never as elastic.
# 4. The role llmgate_semlog_reader (docker/llmgate-es-reader-role.json): read and view
#    the mapping of the semantic log's data streams, and GET / for the version.
# 5. The user grafana_semlog with that role only: Grafana's "Semantic logs" data source
#    reads as it (grafana/provisioning/datasources/datasources.yaml), never as elastic.
#
# Every call is idempotent (PUT replaces, the password is set again), so it runs at each
# `up`; rotating a password is editing its file in docker/secrets/ and `up` again.
# Passwords are read from files and reach curl on its standard input (`-K -`), never on
# its command line, which any user of the host can read in `ps`.
#
#   ES_URL=http://localhost:9200 SECRETS=docker/secrets ROLE_FILE=docker/llmgate-es-role.json \
#     READER_ROLE_FILE=docker/llmgate-es-reader-role.json docker/es-setup.sh
set -euo pipefail

url=${ES_URL:-http://elasticsearch:9200}
secrets=${SECRETS:-/run/secrets}
role_file=${ROLE_FILE:-/setup/llmgate-es-role.json}
role=llmgate_semlog
user=${LLMGATE_ES_USER:-llmgate}
reader_role_file=${READER_ROLE_FILE:-/setup/llmgate-es-reader-role.json}
reader_role=llmgate_semlog_reader
reader=grafana_semlog
attempts=${ATTEMPTS:-30}
pause=${RETRY_SECONDS:-5}

# The secret in $secrets/$1, refused unless JSON and curl's configuration can hold it as
# it is (docker/make-secrets writes only such values).
secret() {
  local value
  value=$(<"$secrets/$1")
  if [[ ! $value =~ ^[A-Za-z0-9._~+-]{8,}$ ]]; then
    echo "es-setup: $secrets/$1 must hold 8 or more letters, digits or ._~+- characters (docker/make-secrets writes one)" >&2
    exit 1
  fi
  printf '%s' "$value"
}

elastic=$(secret elastic_password)
kibana=$(secret kibana_system_password)
llmgate=$(secret llmgate_es_password)
grafana=$(secret grafana_semlog_password)

# One call as elastic: METHOD PATH [more curl configuration lines, e.g. the body].
# Returns 0 for a 2xx answer, 2 for one worth trying again (no answer, 429, 5xx: the
# security index may not be ready yet), 1 for any other.
call() {
  local method=$1 path=$2 answer status
  shift 2
  if ! answer=$({ printf 'user = "elastic:%s"\n' "$elastic"; printf '%s\n' "$@"; } |
    curl -sS -K - -X "$method" -H 'Content-Type: application/json' -w '\n%{http_code}' "$url$path"); then
    return 2
  fi
  status=${answer##*$'\n'}
  case $status in
    2??) return 0 ;;
    429 | 5??) echo "es-setup: $method $path answered $status, trying again" >&2; return 2 ;;
    *) echo "es-setup: $method $path answered $status: ${answer%$'\n'*}" >&2; return 1 ;;
  esac
}

# call, again every $pause seconds while the answer may change.
call_until_done() {
  local attempt rc
  for ((attempt = 1; attempt <= attempts; attempt++)); do
    rc=0
    call "$@" || rc=$?
    case $rc in
      0) echo "es-setup: $1 $2 done"; return 0 ;;
      1) exit 1 ;;
    esac
    sleep "$pause"
  done
  echo "es-setup: $1 $2 still failing after $attempts attempts" >&2
  exit 1
}

call_until_done POST /_security/user/kibana_system/_password \
  "data-binary = \"{\\\"password\\\":\\\"$kibana\\\"}\""
call_until_done PUT "/_security/role/$role" "data-binary = \"@$role_file\""
call_until_done PUT "/_security/user/$user" \
  "data-binary = \"{\\\"password\\\":\\\"$llmgate\\\",\\\"roles\\\":[\\\"$role\\\"],\\\"full_name\\\":\\\"llmgate gateway\\\",\\\"metadata\\\":{\\\"managed_by\\\":\\\"llmgate\\\"}}\""
call_until_done PUT "/_security/role/$reader_role" "data-binary = \"@$reader_role_file\""
call_until_done PUT "/_security/user/$reader" \
  "data-binary = \"{\\\"password\\\":\\\"$grafana\\\",\\\"roles\\\":[\\\"$reader_role\\\"],\\\"full_name\\\":\\\"Grafana, semantic logs\\\",\\\"metadata\\\":{\\\"managed_by\\\":\\\"llmgate\\\"}}\""
echo "es-setup: the gateway writes as $user (role $role), Grafana reads as $reader (role $reader_role); Kibana connects as kibana_system"
