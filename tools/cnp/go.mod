module github.com/twill-net/twill/tools/cnp

go 1.26.8

require sigs.k8s.io/network-policy-api v0.3.0
