// Package cnpapi holds ClusterNetworkPolicy (policy.networking.k8s.io,
// sigs.k8s.io/network-policy-api v0.3.0, v1beta1 and its identical
// v1alpha2) as twilld reads it, and reads it strictly: a field this
// package does not know is named, so that a policy of a newer API is
// never half-enforced.
//
// The types mirror the API's own (apis/v1beta1) field for field. twill
// does not import that module: its go.mod raises k8s.io/api, apimachinery,
// client-go and five more of their dependencies past the versions the
// lab's Kubernetes build pins (tools/modalign keeps them one), for a
// package of plain structs.
package cnpapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group; Version the version twilld watches (the storage
// version); Resource its plural.
const (
	Group    = "policy.networking.k8s.io"
	Version  = "v1beta1"
	Resource = "clusternetworkpolicies"
	Kind     = "ClusterNetworkPolicy"
)

// GroupVersionResource is what twilld lists and watches.
var GroupVersionResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// ClusterNetworkPolicy is one policy.
type ClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`

	// Unknown are the fields Decode found and does not know, with their
	// paths: a newer API's.
	Unknown []string `json:"-"`
}

// Tier is Admin (before NetworkPolicy) or Baseline (after it).
type Tier string

// Tiers.
const (
	Admin    Tier = "Admin"
	Baseline Tier = "Baseline"
)

// Action is what a rule does with the traffic it matches.
type Action string

// Actions.
const (
	Accept Action = "Accept"
	Deny   Action = "Deny"
	Pass   Action = "Pass"
)

// Spec is the policy.
type Spec struct {
	Tier     Tier          `json:"tier"`
	Priority int32         `json:"priority"`
	Subject  Subject       `json:"subject"`
	Ingress  []IngressRule `json:"ingress,omitempty"`
	Egress   []EgressRule  `json:"egress,omitempty"`
}

// Status holds the conditions implementations write.
type Status struct {
	Conditions []metav1.Condition `json:"conditions"`
}

// Subject is the pods the policy applies to: exactly one field is set.
type Subject struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// NamespacedPod selects pods by their namespace's labels and their own.
type NamespacedPod struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

// IngressRule acts on traffic to the subject's pods.
type IngressRule struct {
	Name      string        `json:"name,omitempty"`
	Action    Action        `json:"action"`
	From      []IngressPeer `json:"from"`
	Protocols []Protocol    `json:"protocols,omitempty"`
}

// EgressRule acts on traffic from the subject's pods.
type EgressRule struct {
	Name      string       `json:"name,omitempty"`
	Action    Action       `json:"action"`
	To        []EgressPeer `json:"to"`
	Protocols []Protocol   `json:"protocols,omitempty"`
}

// IngressPeer is a source: exactly one field is set.
type IngressPeer struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// EgressPeer is a destination: exactly one field is set. Nodes and
// DomainNames are the experimental channel's.
type EgressPeer struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *NamespacedPod        `json:"pods,omitempty"`
	Nodes       *metav1.LabelSelector `json:"nodes,omitempty"`
	Networks    []string              `json:"networks,omitempty"`
	DomainNames []string              `json:"domainNames,omitempty"`
}

// Protocol is one protocol and port: exactly one field is set.
// DestinationNamedPort is the experimental channel's.
type Protocol struct {
	TCP                  *PortMatch `json:"tcp,omitempty"`
	UDP                  *PortMatch `json:"udp,omitempty"`
	SCTP                 *PortMatch `json:"sctp,omitempty"`
	DestinationNamedPort string     `json:"destinationNamedPort,omitempty"`
}

// PortMatch is a protocol's destination port; none is any.
type PortMatch struct {
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// Port is a number or a range.
type Port struct {
	Number int32      `json:"number,omitempty"`
	Range  *PortRange `json:"range,omitempty"`
}

// PortRange is a range of ports, both ends included.
type PortRange struct {
	Start int32 `json:"start"`
	End   int32 `json:"end"`
}
