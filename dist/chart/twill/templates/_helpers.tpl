{{/* The image reference: repository:tag, repository@digest, or both. */}}
{{- define "twill.image" -}}
{{- $i := .Values.image -}}
{{- $ref := $i.repository -}}
{{- if $i.tag }}{{ $ref = printf "%s:%s" $ref $i.tag }}{{ end -}}
{{- if $i.digest }}{{ $ref = printf "%s@%s" $ref $i.digest }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* imagePullPolicy, when one is set. */}}
{{- define "twill.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The annotation prefix: flannel's during the flannel migration. */}}
{{- define "twill.annotationPrefix" -}}
{{- if .Values.flannelMigration.enabled -}}
flannel.alpha.coreos.com
{{- else -}}
{{- .Values.annotationPrefix -}}
{{- end -}}
{{- end -}}

{{/*
The backend: Type and the chosen backend's block. A block set for another
backend than the chosen one is refused, as is a backend change by helm
upgrade (the old backend's routes would stay on every node).
*/}}
{{- define "twill.backend" -}}
{{- $b := .Values.backend -}}
{{- range $name := list "vxlan" "wireguard" "eni" -}}
{{- if and (index $b $name) (ne $name $b.type) -}}
{{- fail (printf "backend.%s is set, but backend.type is %q: set only the chosen backend's block" $name $b.type) -}}
{{- end -}}
{{- end -}}
{{- $out := dict "Type" $b.type -}}
{{- with (index $b $b.type | default dict) }}{{ $out = merge $out (deepCopy .) }}{{ end -}}
{{- if not $b.allowChange -}}
{{- $cm := lookup "v1" "ConfigMap" .Values.namespace.name "kube-twill-cfg" -}}
{{- if and $cm $cm.data (index $cm.data "net-conf.json") -}}
{{- $old := (index $cm.data "net-conf.json" | fromJson).Backend | default dict -}}
{{- if and $old.Type (ne $old.Type $b.type) -}}
{{- fail (printf "backend.type: the cluster runs %q, this release asks for %q; a backend does not change in place (its routes would stay on every node): helm uninstall, apply dist/kube-twill-cleanup.yml, then helm install with the new backend (or set backend.allowChange=true)" $old.Type $b.type) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* net-conf.json. */}}
{{- define "twill.netConf" -}}
{{- $c := deepCopy .Values.netConf -}}
{{- if .Values.network }}{{ $_ := set $c "Network" .Values.network }}{{ end -}}
{{- if .Values.ipv6Network -}}
{{- $_ := set $c "EnableIPv6" true -}}
{{- $_ := set $c "IPv6Network" .Values.ipv6Network -}}
{{- if not .Values.network }}{{ $_ := set $c "EnableIPv4" false }}{{ end -}}
{{- else if not .Values.network -}}
{{- fail "network: empty, and so is ipv6Network: set the IPv4 pod network, the IPv6 one, or both" -}}
{{- end -}}
{{- $_ := set $c "Backend" (include "twill.backend" . | fromJson) -}}
{{- toPrettyJson $c -}}
{{- end -}}

{{/* cni-conf.json: the conflist twilld installs. */}}
{{- define "twill.cniConf" -}}
{{- $name := .Values.cniNetwork -}}
{{- if .Values.flannelMigration.enabled }}{{ $name = "cbr0" }}{{ end -}}
{
  "cniVersion": "1.0.0",
  "cniVersions": ["1.0.0", "1.1.0"],
  "name": {{ $name | toJson }},
  "plugins": [
    {
      "type": "twill",
      "subnetFile": "/run/twill/subnet.env",
      "dataDir": "/var/lib/cni/networks",
      "capabilities": { "portMappings": true }
    }
  ]
}
{{- end -}}

{{/* tolerations, nodeSelector and priorityClassName of a pod spec. */}}
{{- define "twill.scheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
