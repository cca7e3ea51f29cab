package cleanup

import (
	"fmt"

	"github.com/twill-net/twill/backend/vxlan"
	"github.com/twill-net/twill/nl"
)

// handOverVXLAN gives twill's VTEP device l to the flanneld that starts
// next on the node (a rollback to flannel): the device is made again under
// flanneld's name for its VNI, with the same VNI, port, local address, MAC
// and MTU, and all that went through it (vxlan.MoveDevice). flanneld adopts
// a device of its name whose configuration matches its own and replaces
// what it programs, so the node's pods are cut off only for milliseconds,
// not until flanneld has started. It returns the new device's name.
func handOverVXLAN(h *nl.Handle, l nl.Link) (string, error) {
	_, v, isVXLAN, err := h.VXLANByName(l.Name)
	if err != nil {
		return "", err
	}
	if !isVXLAN {
		return "", fmt.Errorf("handing %s over to flannel: not a VXLAN device", l.Name)
	}
	v.Name = vxlan.FlannelDeviceName(v.VNI)
	dev, err := vxlan.MoveDevice(h, l, v, 0)
	if err != nil {
		return dev.Name, fmt.Errorf("handing %s over to flannel: %w", l.Name, err)
	}
	return dev.Name, nil
}
