{{/*
The runner pod template: `template` as given, with what `containerMode`
needs merged in the way ARC's gha-runner-scale-set chart merges it (as it
renders on Kubernetes 1.29 or newer, dind's sidecar a native one), so an
ARC values file renders the pod ARC would run, order included:

- containers: in dind and the kubernetes modes the runner container first
  (the template's, or, as ARC renders it, a bare one named runner, with no
  image, variables or mounts, if the template has none: the NOTES say so), then the template's others in their
  order (in dind, a `dind` container of the template's is dropped: the
  sidecar is an init container); with no mode the template's, unchanged.
- the runner's env and volumeMounts: the template's in their order, then the
  mode's the template does not name (kubernetes-novolume: the mounts are the
  template's, or none).
- initContainers (dind): init-dind-externals and dind, then the template's.
- volumes: dind's dind-sock, dind-externals and work, then the template's
  others; kubernetes' work, then the template's others; kubernetes-novolume
  and no mode: the template's.

A `work` volume of the template's takes the place of the mode's, as in ARC.
Where ARC would render two items of one name (the template naming an init
container or volume of the mode's, which no API server accepts in a pod),
the template's takes the mode's place instead: so a template ARC already
expanded, as `arcwright migrate --values` writes it, renders unchanged.

A containerMode.type ARC's chart does not know renders no mode, as in ARC
(the NOTES name it). The CA bundle of githubServerTLS.runnerMountPath and
the proxy variables are not added here: the controller adds them to every
runner pod, so they work the same for a set applied without this chart.
*/}}
{{- define "scaleSet.containerMode" -}}
{{- $mode := "" }}
{{- with .Values.containerMode }}{{ $mode = default "" .type }}{{ end }}
{{- if has $mode (list "dind" "kubernetes" "kubernetes-novolume") }}{{ $mode }}{{ end }}
{{- end }}

{{/* Whether the runners use the runner container hooks (a kubernetes mode). */}}
{{- define "scaleSet.kubernetesMode" -}}
{{- if has (include "scaleSet.containerMode" .) (list "kubernetes" "kubernetes-novolume") }}true{{ end }}
{{- end }}

{{- define "scaleSet.noPermissionServiceAccountName" -}}
{{- printf "%s-no-permission" (include "scaleSet.name" .) }}
{{- end }}

{{- define "scaleSet.kubernetesModeServiceAccountName" -}}
{{- printf "%s-kube-mode" (include "scaleSet.name" .) }}
{{- end }}

{{/* Whether this chart makes the runners' ServiceAccount: the template names none. */}}
{{- define "scaleSet.createsServiceAccount" -}}
{{- $spec := default (dict) .Values.template.spec }}
{{- if not $spec.serviceAccountName }}true{{ end }}
{{- end }}

{{/* The template's items (`to`), then those of `add` whose names it has not: how ARC adds a mode's variables and mounts. */}}
{{- define "scaleSet.addByName" -}}
{{- $to := index . 0 }}
{{- $names := list }}
{{- range $to }}{{ $names = append $names .name }}{{ end }}
{{- range index . 1 }}
{{- if not (has .name $names) }}{{ $to = append $to . }}{{ end }}
{{- end }}
{{- toYaml (dict "items" $to) }}
{{- end }}

{{/* The mode's items (`ours`), each replaced by the template's of its name, then the template's others in their order: how ARC places a mode's init containers and volumes. */}}
{{- define "scaleSet.placeByName" -}}
{{- $ours := index . 0 }}
{{- $theirs := index . 1 }}
{{- $placed := list }}
{{- $names := list }}
{{- range $item := $ours }}
{{- $names = append $names $item.name }}
{{- $pick := $item }}
{{- range $theirs }}{{ if eq .name $item.name }}{{ $pick = . }}{{ end }}{{ end }}
{{- $placed = append $placed $pick }}
{{- end }}
{{- range $theirs }}
{{- if not (has .name $names) }}{{ $placed = append $placed . }}{{ end }}
{{- end }}
{{- toYaml (dict "items" $placed) }}
{{- end }}

{{- define "scaleSet.runnerPodTemplate" -}}
{{- $mode := include "scaleSet.containerMode" . }}
{{- $containerMode := default (dict) .Values.containerMode }}
{{- $template := deepCopy (default (dict) .Values.template) }}
{{- $spec := default (dict) $template.spec }}
{{- $work := dict "name" "work" "mountPath" "/home/runner/_work" }}
{{- $runner := dict }}
{{- range default (list) $spec.containers }}
{{- if and (eq .name "runner") (not $runner) }}{{ $runner = . }}{{ end }}
{{- end }}

{{- if $mode }}
{{- /* The runner container: the mode's variables and mounts after the template's. */}}
{{- $env := list }}
{{- $mounts := list }}
{{- if eq $mode "dind" }}
{{- $env = list (dict "name" "DOCKER_HOST" "value" "unix:///var/run/docker.sock") (dict "name" "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS" "value" "120") }}
{{- $mounts = list $work (dict "name" "dind-sock" "mountPath" "/var/run") }}
{{- else }}
{{- $hooks := ternary "/home/runner/k8s/index.js" "/home/runner/k8s-novolume/index.js" (eq $mode "kubernetes") }}
{{- $env = list (dict "name" "ACTIONS_RUNNER_CONTAINER_HOOKS" "value" $hooks) (dict "name" "ACTIONS_RUNNER_POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) (dict "name" "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER" "value" "true") }}
{{- if eq $mode "kubernetes" }}
{{- $mounts = list $work }}
{{- else }}
{{- /* The hooks start each job's pod from the runner's image. */}}
{{- $env = append $env (dict "name" "ACTIONS_RUNNER_IMAGE" "value" (default "" $runner.image)) }}
{{- end }}
{{- end }}
{{- $merged := dict "name" "runner" }}
{{- if $runner }}
{{- $merged = deepCopy $runner }}
{{- $_ := set $merged "env" (include "scaleSet.addByName" (list (default (list) $runner.env) $env) | fromYaml).items }}
{{- $_ := set $merged "volumeMounts" (default (list) (include "scaleSet.addByName" (list (default (list) $runner.volumeMounts) $mounts) | fromYaml).items) }}
{{- end }}
{{- $containers := list $merged }}
{{- range default (list) $spec.containers }}
{{- if not (or (eq .name "runner") (and (eq $mode "dind") (eq .name "dind"))) }}{{ $containers = append $containers . }}{{ end }}
{{- end }}
{{- $_ := set $spec "containers" $containers }}
{{- end }}

{{- /* dind: the externals copied for the sidecar, the sidecar, then the template's init containers. */}}
{{- if eq $mode "dind" }}
{{- $externals := dict "name" "init-dind-externals" }}
{{- if $runner }}
{{- $externals = dict "name" "init-dind-externals" "command" (list "cp") "args" (list "-r" "/home/runner/externals/." "/home/runner/tmpDir/") "volumeMounts" (list (dict "name" "dind-externals" "mountPath" "/home/runner/tmpDir")) }}
{{- with $runner.image }}{{ $_ := set $externals "image" . }}{{ end }}
{{- end }}
{{- $probe := dict "exec" (dict "command" (list "docker" "info")) "initialDelaySeconds" 0 "failureThreshold" 24 "periodSeconds" 5 }}
{{- $dind := dict "name" "dind" "image" "docker:dind" "args" (list "dockerd" "--host=unix:///var/run/docker.sock" "--group=$(DOCKER_GROUP_GID)") "env" (list (dict "name" "DOCKER_GROUP_GID" "value" "123")) "securityContext" (dict "privileged" true) "restartPolicy" "Always" "startupProbe" $probe "volumeMounts" (list $work (dict "name" "dind-sock" "mountPath" "/var/run") (dict "name" "dind-externals" "mountPath" "/home/runner/externals")) }}
{{- $_ := set $spec "initContainers" (include "scaleSet.placeByName" (list (list $externals $dind) (default (list) $spec.initContainers)) | fromYaml).items }}
{{- end }}

{{- /* The volumes the mode mounts, before the template's others. */}}
{{- $volumes := default (list) $spec.volumes }}
{{- if eq $mode "dind" }}
{{- $volumes = (include "scaleSet.placeByName" (list (list (dict "name" "dind-sock" "emptyDir" (dict)) (dict "name" "dind-externals" "emptyDir" (dict)) (dict "name" "work" "emptyDir" (dict))) $volumes) | fromYaml).items }}
{{- else if eq $mode "kubernetes" }}
{{- $named := list }}
{{- range $volumes }}{{ $named = append $named .name }}{{ end }}
{{- $claim := dict }}
{{- if not (has "work" $named) }}
{{- $claim = required "containerMode.kubernetesModeWorkVolumeClaim is required with containerMode.type=kubernetes (or a volume named work in template.spec.volumes), e.g. {accessModes: [ReadWriteOnce], storageClassName: standard, resources: {requests: {storage: 1Gi}}}" $containerMode.kubernetesModeWorkVolumeClaim }}
{{- end }}
{{- $volumes = (include "scaleSet.placeByName" (list (list (dict "name" "work" "ephemeral" (dict "volumeClaimTemplate" (dict "spec" $claim)))) $volumes) | fromYaml).items }}
{{- end }}
{{- if or $volumes (eq $mode "kubernetes-novolume") }}
{{- $_ := set $spec "volumes" (default (list) $volumes) }}
{{- end }}

{{- /* The runners' ServiceAccount: the template's, else one with no rights, or the hooks' in a kubernetes mode. */}}
{{- if include "scaleSet.createsServiceAccount" . }}
{{- $_ := set $spec "serviceAccountName" (ternary (include "scaleSet.kubernetesModeServiceAccountName" .) (include "scaleSet.noPermissionServiceAccountName" .) (eq (include "scaleSet.kubernetesMode" .) "true")) }}
{{- end }}
{{- $_ := set $template "spec" $spec }}
{{- toYaml $template }}
{{- end }}

{{/*
The pod-validation policy. dind runs a privileged sidecar, which the bundled
policy refuses unless allowPrivileged is set, so choosing dind sets it on the
bundled policy (named in the NOTES); a policy of the user's own judges the
sidecar itself. A bundled policy told allowPrivileged: false cannot pass the
dind sidecar: that is refused here rather than in every runner's status.
*/}}
{{- define "scaleSet.podValidationPolicy" -}}
{{- $policy := deepCopy (default (dict) .Values.podValidationPolicy) }}
{{- if eq (include "scaleSet.containerMode" .) "dind" }}
{{- if not $policy }}
{{- $policy = dict "builtin" "default" }}
{{- end }}
{{- if eq (default "" $policy.builtin) "default" }}
{{- $settings := default (dict) $policy.settings }}
{{- if and (hasKey $settings "allowPrivileged") (not $settings.allowPrivileged) }}
{{- fail "containerMode.type=dind runs a privileged docker:dind sidecar, which podValidationPolicy.settings.allowPrivileged=false refuses: remove the setting, or use another container mode" }}
{{- end }}
{{- $_ := set $settings "allowPrivileged" true }}
{{- $_ := set $policy "settings" $settings }}
{{- end }}
{{- end }}
{{- with $policy }}{{ toYaml . }}{{ end }}
{{- end }}
