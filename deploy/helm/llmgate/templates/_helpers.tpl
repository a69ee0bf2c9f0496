{{/* Names and labels. */}}
{{- define "llmgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "llmgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "llmgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "llmgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The gateway image: -cpu or -cuda unless a tag is given. */}}
{{- define "llmgate.image" -}}
{{- $flavor := ternary "cuda" "cpu" .Values.gpu.enabled }}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion $flavor) .Values.image.tag }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "llmgate.fetchImage" -}}
{{- $tag := default (printf "%s-fetch-model" .Chart.AppVersion) .Values.model.fetch.image.tag }}
{{- printf "%s:%s" .Values.model.fetch.image.repository $tag }}
{{- end }}

{{/* Seconds the drain takes at most: the gateway's shutdown timeout. */}}
{{- define "llmgate.drainSeconds" -}}
{{- $server := (include "llmgate.parsedConfig" . | fromJson).server | default dict }}
{{- $server.shutdown_timeout_secs | default 25 | int }}
{{- end }}

{{/*
The grace period: preStop sleep + drain + what the gateway does after the drain (2 s for
cut-off streams to end, 5 s for the HTTP server to stop, 1 s for the metrics listener,
5 s to write the semantic-log queue, 5 s to send traces) + margin.
*/}}
{{- define "llmgate.afterDrainSeconds" -}}18{{- end }}
{{- define "llmgate.graceSeconds" -}}
{{- add (int .Values.preStopSleepSeconds) (include "llmgate.drainSeconds" . | int) (include "llmgate.afterDrainSeconds" . | int) (int .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/* The fewest pods there are: the autoscaler's minimum, or replicaCount. */}}
{{- define "llmgate.minPods" -}}
{{- if .Values.keda.enabled }}{{ .Values.keda.minReplicas | int }}
{{- else if .Values.autoscaling.enabled }}{{ .Values.autoscaling.minReplicas | int }}
{{- else }}{{ .Values.replicaCount | int }}
{{- end }}
{{- end }}

{{/*
The configuration, parsed (and so checked) from the values' TOML. The keys the chart's
layout fixes are its own: they reach the gateway as environment variables (which win over
the file), so the file must not set them too.
*/}}
{{- define "llmgate.parsedConfig" -}}
{{- $config := fromToml .Values.config }}
{{- if hasKey $config "Error" }}
{{- fail (printf "config is not TOML: %s" $config.Error) }}
{{- end }}
{{- $owned := dict "server" (list "listen" "metrics_listen" "api_keys_file") "engine" (list "model_path") "semlog" (list "data_dir") }}
{{- range $table, $keys := $owned }}
{{- range $key := $keys }}
{{- if hasKey (get $config $table | default dict) $key }}
{{- fail (printf "config sets %s.%s, which the chart sets (port, metricsPort, model.file, apiKeys, the data volume)" $table $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- /*
Secrets stay out of the ConfigMap, which anyone who may read the namespace's ConfigMaps
reads (and `kubectl describe` prints); each has a Secret path instead.
*/}}
{{- $semlog := get $config "semlog" | default dict }}
{{- $secretPaths := dict "es_password" "elasticsearch.existingSecret (its `password`)" "es_api_key" "elasticsearch.existingSecret (its `api_key`)" "redaction_key" "redaction.existingSecret" }}
{{- range $key, $path := $secretPaths }}
{{- if hasKey $semlog $key }}
{{- fail (printf "config sets semlog.%s, a secret, which would land in the ConfigMap: give it from a Secret with %s" $key $path) }}
{{- end }}
{{- end }}
{{- $state := get $config "state" | default dict }}
{{- if hasKey $state "redis_password" }}
{{- fail "config sets state.redis_password, a secret, which would land in the ConfigMap: give it from a Secret with redis.existingSecret" }}
{{- end }}
{{- if and $.Values.redis.existingSecret (not (hasKey $state "redis_url")) }}
{{- fail "redis.existingSecret gives a password to no Redis: set config's state.redis_url" }}
{{- end }}
{{- $engine := get $config "engine" | default dict }}
{{- $upstreamKey := "give it from a Secret: api_key_env with extraEnv from a secretKeyRef, or api_key_file on a mounted Secret (docs/kubernetes.md)" }}
{{- if hasKey $engine "upstream_api_key" }}
{{- fail (printf "config sets engine.upstream_api_key, a secret, which would land in the ConfigMap: %s" $upstreamKey) }}
{{- end }}
{{- $urls := dict "semlog.es_url" ($semlog.es_url | default "") "engine.upstream_url" ($engine.upstream_url | default "") "state.redis_url" ($state.redis_url | default "") }}
{{- range $i, $model := get $config "models" | default list }}
{{- if hasKey $model "api_key" }}
{{- fail (printf "config sets models[%d].api_key, a secret, which would land in the ConfigMap: %s" $i $upstreamKey) }}
{{- end }}
{{- $_ := set $urls (printf "models[%d].url" $i) ($model.url | default "") }}
{{- range $j, $url := $model.urls | default list }}
{{- $_ := set $urls (printf "models[%d].urls[%d]" $i $j) $url }}
{{- end }}
{{- end }}
{{- range $key, $url := $urls }}
{{- if regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@" (toString $url) }}
{{- fail (printf "config's %s holds a password (user:password@), which would land in the ConfigMap: give credentials from a Secret (elasticsearch.existingSecret; an upstream's api_key_env)" $key) }}
{{- end }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/* Whole cores of a CPU quantity ("2", 2, "2500m"), at least 1. */}}
{{- define "llmgate.cores" -}}
{{- $cpu := toString . }}
{{- $cores := 1 }}
{{- if hasSuffix "m" $cpu }}
{{- $cores = div (trimSuffix "m" $cpu | int) 1000 }}
{{- else }}
{{- $cores = $cpu | float64 | floor | int }}
{{- end }}
{{- max 1 $cores }}
{{- end }}
