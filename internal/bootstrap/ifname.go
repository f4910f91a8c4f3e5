package bootstrap

import (
	"fmt"
	"net"
	"strings"
)

// Iface is a network interface and the address hcomm uses on it.
type Iface struct {
	Name string
	IP   net.IP
}

// ParseIfname parses an HCOMM_SOCKET_IFNAME value, NCCL_SOCKET_IFNAME's
// syntax: a comma-separated list of interface name prefixes ("eth,ib" picks
// eth0, eth1, ib0…); a leading '^' turns the whole list into exclusions
// ("^docker,lo"); a leading '=' makes the names exact ("=eth0"; "^=eth0").
// It returns a match function.
func ParseIfname(spec string) (func(name string) bool, error) {
	spec = strings.TrimSpace(spec)
	exclude, exact := false, false
	if strings.HasPrefix(spec, "^") {
		exclude, spec = true, spec[1:]
	}
	if strings.HasPrefix(spec, "=") {
		exact, spec = true, spec[1:]
	}
	var names []string
	for _, n := range strings.Split(spec, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("HCOMM_SOCKET_IFNAME=%q names no interface", spec)
	}
	return func(name string) bool {
		hit := false
		for _, n := range names {
			if name == n || (!exact && strings.HasPrefix(name, n)) {
				hit = true
				break
			}
		}
		return hit != exclude
	}, nil
}

// PickIface chooses the interface and address for bootstrap and tcp
// channels. With spec (HCOMM_SOCKET_IFNAME) set, the first up interface that
// matches it and has an address (IPv4 first, then IPv6) wins, in the kernel's
// order; no match is an error naming the interfaces there are. Without spec
// the first up, non-loopback interface that is not a container bridge
// (docker*, veth*, virbr*) wins, and loopback when there is nothing else.
func PickIface(spec string) (Iface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return Iface{}, fmt.Errorf("listing network interfaces: %w", err)
	}
	var match func(string) bool
	if spec != "" {
		if match, err = ParseIfname(spec); err != nil {
			return Iface{}, err
		}
	}
	var names []string
	var loop Iface
	for _, fam := range []int{4, 6} {
		for _, ifc := range ifs {
			if fam == 4 {
				names = append(names, ifc.Name)
			}
			if ifc.Flags&net.FlagUp == 0 {
				continue
			}
			if match != nil {
				if !match(ifc.Name) {
					continue
				}
			} else if strings.HasPrefix(ifc.Name, "docker") || strings.HasPrefix(ifc.Name, "veth") ||
				strings.HasPrefix(ifc.Name, "virbr") {
				continue
			}
			ip := ifaceIP(ifc, fam)
			if ip == nil {
				continue
			}
			if match == nil && ifc.Flags&net.FlagLoopback != 0 {
				if loop.IP == nil {
					loop = Iface{Name: ifc.Name, IP: ip}
				}
				continue
			}
			return Iface{Name: ifc.Name, IP: ip}, nil
		}
	}
	if match == nil && loop.IP != nil {
		return loop, nil
	}
	if match != nil {
		return Iface{}, fmt.Errorf("HCOMM_SOCKET_IFNAME=%q matches no interface that is up with an address (interfaces: %s)", spec, strings.Join(names, ", "))
	}
	return Iface{}, fmt.Errorf("no network interface is up with an address (interfaces: %s)", strings.Join(names, ", "))
}

func ifaceIP(ifc net.Interface, fam int) net.IP {
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		if ip4 := ipn.IP.To4(); fam == 4 && ip4 != nil {
			return ip4
		}
		if fam == 6 && ipn.IP.To4() == nil {
			return ipn.IP
		}
	}
	return nil
}
