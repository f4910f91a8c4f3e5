package hcomm

import (
	"os"

	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/inproc"
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// MaxInitAllOver bounds the rank count of InitAllOver.
const MaxInitAllOver = 1 << 16

// InitAllOver creates len(dialers) communicators in this process, as InitAll
// does, whose channels are all carried by the given transport: rank r's by
// dialers[r], whatever the protocol (the simulator's, channel/sim, or a
// transport of the caller's own). hosts, when not nil, names the host of
// each rank (len(dialers) of them): the two-level algorithms group ranks by
// it, as they group processes by shared memory otherwise; nil puts every rank
// on one host. Unlike InitAll it is not bounded by device.MaxDevices: rank r
// opens a context on device r mod device.MaxDevices. cfg may be nil;
// cfg.Transport must be empty. The communicators' sub-communicators use
// their parent's Dialer; Destroy closes it with the rank's other resources.
// On error nothing is left open.
func InitAllOver(dialers []channel.Dialer, hosts []string, cfg *Config) ([]*Comm, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.resolve()
	if err != nil {
		return nil, noRankErr("InitAllOver", c.Name, ErrPara, err, "")
	}
	n := len(dialers)
	if n == 0 || n > MaxInitAllOver {
		return nil, noRankErr("InitAllOver", c.Name, ErrPara, nil, "rank count %d is outside [1, %d]", n, MaxInitAllOver)
	}
	if hosts != nil && len(hosts) != n {
		return nil, noRankErr("InitAllOver", c.Name, ErrPara, nil, "%d host names for %d ranks", len(hosts), n)
	}
	for r, d := range dialers {
		if d == nil {
			return nil, noRankErr("InitAllOver", c.Name, ErrPara, nil, "rank %d has no Dialer", r)
		}
	}
	if c.Transport != "" {
		return nil, noRankErr("InitAllOver", c.Name, ErrPara, nil, "Config.Transport %q is set: InitAllOver carries every channel over its own Dialers", c.Transport)
	}
	store := bootstrap.NewMemStore()
	secret, err := bootstrap.NewSecret()
	if err != nil {
		return nil, noRankErr("InitAllOver", c.Name, ErrSyscall, err, "")
	}
	boot := &bootState{store: store, fabric: inproc.NewFabric(), secret: secret, release: store.Close}
	// The ranks' links are the dialers' (a simulated cluster's, for one),
	// whose cost this process's cores do not tell: a rank's processors are
	// its dialer's word (channel.HostProcessors), counted per host it
	// names, and without it the communicator is not Crowded.
	host := hostID()
	me := peerInfo{NRanks: n, Proc: procToken, PID: os.Getpid()}
	me.Hostname, _ = os.Hostname()
	for r := 0; r < n; r++ {
		me.Rank, me.Host = r, host
		me.ShmHost = "over:one host"
		if hosts != nil {
			me.ShmHost = "over:" + hosts[r]
		}
		me.CPUs = 0
		if hp, ok := dialers[r].(channel.HostProcessors); ok {
			me.CPUs = hp.HostProcessors()
			me.Host = me.ShmHost
		}
		boot.peers = append(boot.peers, me)
	}
	comms := make([]*Comm, 0, n)
	for r := 0; r < n; r++ {
		cm, err := newComm("InitAllOver", c, r, n, r%device.MaxDevices, boot)
		if err == nil {
			err = cm.setCustom(dialers[r])
		}
		if err != nil {
			if cm != nil {
				cm.Destroy()
			}
			for _, x := range comms {
				x.Destroy()
			}
			return nil, err
		}
		comms = append(comms, cm)
	}
	return comms, nil
}

// setCustom makes d carry every channel of c (InitAllOver).
func (c *Comm) setCustom(d channel.Dialer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.dialers[d.Name()]; ok {
		return c.errorf("InitAllOver", -1, ErrPara, nil, "the Dialer's name %q is taken", d.Name())
	}
	c.custom = d
	if lc, ok := d.(channel.LocalCoster); ok {
		c.localCost = lc
	}
	return nil
}

// customTransport is the table entry of the Dialer that carries every
// channel of c (InitAllOver), or nil when there is none.
func (c *Comm) customTransport() *transport {
	d := c.custom
	if d == nil {
		return nil
	}
	rc, ok := d.(channel.ReceiverChecker) // said of every channel it makes
	return &transport{name: d.Name(),
		canReach:  func(*Config, *peerInfo, *peerInfo) bool { return true },
		newDialer: func(*Comm) (channel.Dialer, error) { return d, nil },
		takesLent: ok && rc.ChecksOnReceipt()}
}

// chargeLocal tells a virtual-time Dialer of a local copy or reduction of n
// bytes (see channel.LocalCoster); nothing otherwise.
func (c *Comm) chargeLocal(n int64) {
	if c != nil && c.localCost != nil {
		c.localCost.LocalWork(n)
	}
}
