{{- define "scaleSet.name" -}}
{{- default .Release.Name .Values.runnerScaleSetName | trunc 45 | trimSuffix "-" }}
{{- end }}

{{- define "scaleSet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "scaleSet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: arcwright
app.kubernetes.io/component: runner-scale-set
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The Secret the scale set reads: an existing one by name, or ours. */}}
{{- define "scaleSet.secretName" -}}
{{- if kindIs "string" .Values.githubConfigSecret }}
{{- .Values.githubConfigSecret }}
{{- else }}
{{- printf "%s-github-secret" (include "scaleSet.name" .) }}
{{- end }}
{{- end }}

{{- define "scaleSet.policyConfigMapName" -}}
{{- default (printf "%s-policy" .Release.Name) .Values.policyConfigMap.name }}
{{- end }}

{{/* The namespace of every object: ARC's namespaceOverride, else the release's. */}}
{{- define "scaleSet.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/*
The namespace, labels and annotations of one object of this chart: the
chart's own, `labels` and `annotations`, then what ARC's
`resourceMeta.<key>` adds for that kind of object. Called with (list . key).
*/}}
{{- define "scaleSet.objectMeta" -}}
{{- $ctx := index . 0 }}
{{- $extra := default (dict) (get (default (dict) $ctx.Values.resourceMeta) (index . 1)) }}
{{- $labels := merge (default (dict) (deepCopy (default (dict) $extra.labels))) (include "scaleSet.labels" $ctx | fromYaml) }}
{{- $annotations := merge (default (dict) (deepCopy (default (dict) $extra.annotations))) (default (dict) (deepCopy (default (dict) $ctx.Values.annotations))) }}
namespace: {{ include "scaleSet.namespace" $ctx }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The values ARC's gha-runner-scale-set chart ignores and so this one, one
line each for the NOTES: keys that files/known-values.yaml does not list, at
the top and inside ARC's own values (a misspelt key is one: ARC installs the
file without it, and so does this chart), and a containerMode.type ARC's
chart does not know (it renders no container mode).
*/}}
{{- define "scaleSet.ignoredValues" -}}
{{- $known := .Files.Get "files/known-values.yaml" | fromYaml }}
{{- $ignored := list }}
{{- range $path := keys $known | sortAlpha }}
{{- $value := $.Values }}
{{- range $key := compact (splitList "." $path) }}
{{- $value = get (ternary $value (dict) (kindIs "map" $value)) $key }}
{{- end }}
{{- if kindIs "map" $value }}
{{- range $key := keys $value | sortAlpha }}
{{- if not (has $key (get $known $path)) }}
{{- $ignored = append $ignored (printf "%s: a key neither ARC's chart nor this one reads (misspelt?)" (trimPrefix "." (printf "%s.%s" $path $key))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $type := "" }}
{{- with .Values.containerMode }}{{ $type = default "" .type }}{{ end }}
{{- if and $type (not (include "scaleSet.containerMode" .)) }}
{{- $ignored = append $ignored (printf "containerMode.type %q: not a mode ARC's chart knows (dind, kubernetes, kubernetes-novolume), so, as with ARC, the runners get no container mode" $type) }}
{{- end }}
{{- toYaml (dict "lines" $ignored) }}
{{- end }}
