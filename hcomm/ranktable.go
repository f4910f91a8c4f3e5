package hcomm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/hcomm-dev/hcomm/internal/bootstrap"
)

// RankTable is HCCL's rank table, version "1.0" (the A2 template): the
// servers of a job and the devices on each, every value a JSON string.
type RankTable struct {
	Status      string       `json:"status"`
	Version     string       `json:"version"`
	ServerCount string       `json:"server_count"`
	ServerList  []RankServer `json:"server_list"`
}

// RankServer is one entry of server_list.
type RankServer struct {
	ServerID string       `json:"server_id"`
	HostIP   string       `json:"host_ip,omitempty"` // not in the 1.0 template; accepted when present
	Devices  []RankDevice `json:"device"`
}

// RankDevice is one device of a server.
type RankDevice struct {
	DeviceID   string `json:"device_id"`
	DeviceIP   string `json:"device_ip"`
	DevicePort string `json:"device_port,omitempty"`
	RankID     string `json:"rank_id"`
}

// rankEntry is a rank's place in a parsed table.
type rankEntry struct {
	server   int
	deviceID int
}

// ParseRankTable parses and checks a rank table: version "1.0", status
// "completed", server_count equal to the servers listed, unique server ids,
// device ids that are integers, rank ids that are exactly 0..n-1 once each.
// Unknown fields are errors, as are trailing bytes.
func ParseRankTable(b []byte) (*RankTable, error) {
	var t RankTable
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("rank table: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("rank table: trailing data after the JSON object")
	}
	if _, err := t.ranks(); err != nil {
		return nil, err
	}
	return &t, nil
}

func (t *RankTable) ranks() ([]rankEntry, error) {
	if t.Version != "1.0" {
		return nil, fmt.Errorf("rank table: version %q is not supported (want \"1.0\")", t.Version)
	}
	if t.Status != "completed" {
		return nil, fmt.Errorf("rank table: status %q: the table is not ready (want \"completed\")", t.Status)
	}
	sc, err := strconv.Atoi(t.ServerCount)
	if err != nil || sc != len(t.ServerList) || sc < 1 {
		return nil, fmt.Errorf("rank table: server_count %q does not match the %d servers listed", t.ServerCount, len(t.ServerList))
	}
	n := 0
	for _, s := range t.ServerList {
		n += len(s.Devices)
	}
	if n > MaxRanks {
		return nil, fmt.Errorf("rank table: %d ranks exceed %d", n, MaxRanks)
	}
	out := make([]rankEntry, n)
	seen := make([]bool, n)
	ids := map[string]bool{}
	for si, s := range t.ServerList {
		if s.ServerID == "" || len(s.ServerID) >= 64 || ids[s.ServerID] {
			return nil, fmt.Errorf("rank table: server %d: server_id %q is empty, 64 bytes or longer, or repeated", si, s.ServerID)
		}
		ids[s.ServerID] = true
		if len(s.Devices) == 0 {
			return nil, fmt.Errorf("rank table: server %q lists no device", s.ServerID)
		}
		for di, d := range s.Devices {
			r, err := strconv.Atoi(d.RankID)
			if err != nil || r < 0 || r >= n || strconv.Itoa(r) != d.RankID {
				return nil, fmt.Errorf("rank table: server %q device %d: rank_id %q is not an integer in [0, %d)", s.ServerID, di, d.RankID, n)
			}
			if seen[r] {
				return nil, fmt.Errorf("rank table: rank_id %d appears twice", r)
			}
			seen[r] = true
			dev, err := strconv.Atoi(d.DeviceID)
			if err != nil || dev < 0 {
				return nil, fmt.Errorf("rank table: server %q rank %d: device_id %q is not a non-negative integer", s.ServerID, r, d.DeviceID)
			}
			out[r] = rankEntry{server: si, deviceID: dev}
		}
	}
	return out, nil
}

// InitClusterInfo joins rank of the communicator described by the rank table
// at rankTablePath (HcclCommInitClusterInfo; HCCL's rank table JSON, version
// "1.0", see ParseRankTable). rank must be one of the table's rank_id values;
// its device_id is the device the communicator opens. cfg may be nil.
//
// The table names no bootstrap port, so hcomm's rendezvous is: rank 0's
// server — its host_ip when the entry has one, else its server_id, which must
// then be an address or a resolvable host name (HCCL tables often use the
// host's IP as server_id) — on port HCOMM_ROOT_PORT, default DefaultRootPort
// (29500). HCOMM_MASTER_ADDR=host:port overrides both. The secret is
// HCOMM_SECRET when set, else derived from the table's bytes, which every
// rank reads and strangers without the file do not know.
//
// InitClusterInfo is InitClusterInfoContext with context.Background().
func InitClusterInfo(rankTablePath string, rank int, cfg *Config) (*Comm, error) {
	return InitClusterInfoContext(context.Background(), rankTablePath, rank, cfg)
}

// InitClusterInfoContext is InitClusterInfo bounded by ctx as well, as
// InitRootInfoContext is.
func InitClusterInfoContext(ctx context.Context, rankTablePath string, rank int, cfg *Config) (*Comm, error) {
	const op = "InitClusterInfo"
	if ctx == nil {
		return nil, &Error{Op: op, Rank: rank, Peer: -1, Code: ErrPara, Msg: "nil context"}
	}
	c, err := resolveAll(cfg)
	if err != nil {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: ErrPara, Err: err}
	}
	fail := func(code Result, err error) (*Comm, error) {
		return nil, &Error{Op: op, Comm: c.Name, Rank: rank, Peer: -1, Code: code, Err: err}
	}
	if len(rankTablePath) > 4096 {
		return fail(ErrPara, fmt.Errorf("rank table path of %d bytes exceeds 4096", len(rankTablePath)))
	}
	b, err := os.ReadFile(rankTablePath)
	if err != nil {
		return fail(ErrOpenFile, err)
	}
	t, err := ParseRankTable(b)
	if err != nil {
		return fail(ErrPara, fmt.Errorf("%s: %w", rankTablePath, err))
	}
	entries, _ := t.ranks()
	if rank < 0 || rank >= len(entries) {
		return fail(ErrPara, fmt.Errorf("rank %d is not a rank_id of %s (it has ranks 0..%d)", rank, rankTablePath, len(entries)-1))
	}
	addr, err := rankTableRoot(t, entries, os.Getenv)
	if err != nil {
		return fail(ErrPara, fmt.Errorf("%s: %w", rankTablePath, err))
	}
	listen, err := listenAddr(c, addr)
	if err != nil {
		return fail(ErrNetwork, err)
	}
	secret := bootstrap.DeriveSecret("ranktable\x00" + string(b))
	if s := os.Getenv("HCOMM_SECRET"); s != "" {
		secret = bootstrap.DeriveSecret(s)
	}
	return join(ctx, op, c, joinSpec{nRanks: len(entries), rank: rank, localRank: entries[rank].deviceID,
		addr: addr, listen: listen, secret: secret})
}

func rankTableRoot(t *RankTable, entries []rankEntry, getenv func(string) string) (string, error) {
	if a := getenv("HCOMM_MASTER_ADDR"); a != "" {
		return checkHostPort("HCOMM_MASTER_ADDR", a)
	}
	port := strconv.Itoa(DefaultRootPort)
	if p := getenv("HCOMM_ROOT_PORT"); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("HCOMM_ROOT_PORT=%q is not a port in [1, 65535]", p)
		}
		port = p
	}
	s := t.ServerList[entries[0].server]
	host := s.HostIP
	if host == "" {
		host = s.ServerID
	}
	if net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return "", fmt.Errorf("rank 0's server %q has no host_ip and its server_id is neither an address nor a host name (%v): set HCOMM_MASTER_ADDR=host:port", s.ServerID, err)
		}
	}
	return net.JoinHostPort(host, port), nil
}
