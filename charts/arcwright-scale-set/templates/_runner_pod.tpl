{{/*
The runner pod template: `template` as given, with what `containerMode`
needs merged in the way ARC's gha-runner-scale-set chart merges it, so an
ARC values file renders the pod ARC would run.

What a mode adds never replaces what the template says: an environment
variable, a volume mount, a volume or an init container the template already
names is kept as written and the mode's is left out. (ARC does the same for
variables, mounts and volumes; an init container of the same name as ARC's
would make ARC render two, which the API server refuses.)

The CA bundle of githubServerTLS.runnerMountPath and the proxy variables are
not added here: the controller adds them to every runner pod, so they work
the same for a set applied without this chart.
*/}}
{{- define "scaleSet.containerMode" -}}
{{- $mode := "" }}
{{- with .Values.containerMode }}{{ $mode = default "" .type }}{{ end }}
{{- if not (has $mode (list "" "dind" "kubernetes" "kubernetes-novolume")) }}
{{- fail (printf "containerMode.type %q is not one of dind, kubernetes, kubernetes-novolume" $mode) }}
{{- end }}
{{- $mode }}
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

{{/* `add`'s items whose names `to` has not, appended to `to`. */}}
{{- define "scaleSet.addByName" -}}
{{- $to := index . 0 }}
{{- $names := list }}
{{- range $to }}{{ $names = append $names .name }}{{ end }}
{{- range index . 1 }}
{{- if not (has .name $names) }}{{ $to = append $to . }}{{ end }}
{{- end }}
{{- toYaml (dict "items" $to) }}
{{- end }}

{{- define "scaleSet.runnerPodTemplate" -}}
{{- $mode := include "scaleSet.containerMode" . }}
{{- $containerMode := default (dict) .Values.containerMode }}
{{- $template := deepCopy (default (dict) .Values.template) }}
{{- $spec := default (dict) $template.spec }}
{{- $runnerImage := "ghcr.io/actions/actions-runner:latest" }}
{{- $work := dict "name" "work" "mountPath" "/home/runner/_work" }}

{{- /* The runner container: the mode's variables and mounts. */}}
{{- $env := list }}
{{- $mounts := list }}
{{- if eq $mode "dind" }}
{{- $env = list (dict "name" "DOCKER_HOST" "value" "unix:///var/run/docker.sock") (dict "name" "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS" "value" "120") }}
{{- $mounts = list $work (dict "name" "dind-sock" "mountPath" "/var/run") }}
{{- else if include "scaleSet.kubernetesMode" . }}
{{- $hooks := ternary "/home/runner/k8s/index.js" "/home/runner/k8s-novolume/index.js" (eq $mode "kubernetes") }}
{{- $env = list (dict "name" "ACTIONS_RUNNER_CONTAINER_HOOKS" "value" $hooks) (dict "name" "ACTIONS_RUNNER_POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) (dict "name" "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER" "value" "true") }}
{{- if eq $mode "kubernetes" }}{{ $mounts = list $work }}{{ end }}
{{- end }}
{{- $containers := list }}
{{- range $container := default (list) $spec.containers }}
{{- if eq $container.name "runner" }}
{{- with $container.image }}{{ $runnerImage = . }}{{ end }}
{{- $withEnv := (include "scaleSet.addByName" (list (default (list) $container.env) $env) | fromYaml).items }}
{{- if $withEnv }}{{ $_ := set $container "env" $withEnv }}{{ end }}
{{- $withMounts := (include "scaleSet.addByName" (list (default (list) $container.volumeMounts) $mounts) | fromYaml).items }}
{{- if $withMounts }}{{ $_ := set $container "volumeMounts" $withMounts }}{{ end }}
{{- end }}
{{- $containers = append $containers $container }}
{{- end }}
{{- $_ := set $spec "containers" $containers }}

{{- /* dind: the externals copied for the sidecar, and the sidecar itself. */}}
{{- if eq $mode "dind" }}
{{- $externals := dict "name" "init-dind-externals" "image" $runnerImage "command" (list "cp") "args" (list "-r" "/home/runner/externals/." "/home/runner/tmpDir/") "volumeMounts" (list (dict "name" "dind-externals" "mountPath" "/home/runner/tmpDir")) }}
{{- $probe := dict "exec" (dict "command" (list "docker" "info")) "initialDelaySeconds" 0 "failureThreshold" 24 "periodSeconds" 5 }}
{{- $dind := dict "name" "dind" "image" "docker:dind" "args" (list "dockerd" "--host=unix:///var/run/docker.sock" "--group=$(DOCKER_GROUP_GID)") "env" (list (dict "name" "DOCKER_GROUP_GID" "value" "123")) "securityContext" (dict "privileged" true) "restartPolicy" "Always" "startupProbe" $probe "volumeMounts" (list $work (dict "name" "dind-sock" "mountPath" "/var/run") (dict "name" "dind-externals" "mountPath" "/home/runner/externals")) }}
{{- $user := default (list) $spec.initContainers }}
{{- /* A dind the template already runs, as an init container or (older ARC) a container, is kept instead of ours. */}}
{{- $names := list }}
{{- range $user }}{{ $names = append $names .name }}{{ end }}
{{- range $spec.containers }}{{ $names = append $names .name }}{{ end }}
{{- $ours := list }}
{{- range (list $externals $dind) }}{{ if not (has .name $names) }}{{ $ours = append $ours . }}{{ end }}{{ end }}
{{- $_ := set $spec "initContainers" (concat $ours $user) }}
{{- end }}

{{- /* The volumes the mode mounts. */}}
{{- $volumes := list }}
{{- if eq $mode "dind" }}
{{- $volumes = list (dict "name" "dind-sock" "emptyDir" (dict)) (dict "name" "dind-externals" "emptyDir" (dict)) (dict "name" "work" "emptyDir" (dict)) }}
{{- else if eq $mode "kubernetes" }}
{{- $named := list }}
{{- range default (list) $spec.volumes }}{{ $named = append $named .name }}{{ end }}
{{- if not (has "work" $named) }}
{{- $claim := required "containerMode.kubernetesModeWorkVolumeClaim is required with containerMode.type=kubernetes (or a volume named work in template.spec.volumes), e.g. {accessModes: [ReadWriteOnce], storageClassName: standard, resources: {requests: {storage: 1Gi}}}" $containerMode.kubernetesModeWorkVolumeClaim }}
{{- $volumes = list (dict "name" "work" "ephemeral" (dict "volumeClaimTemplate" (dict "spec" $claim))) }}
{{- end }}
{{- end }}
{{- $withVolumes := (include "scaleSet.addByName" (list (default (list) $spec.volumes) $volumes) | fromYaml).items }}
{{- if $withVolumes }}{{ $_ := set $spec "volumes" $withVolumes }}{{ end }}

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
