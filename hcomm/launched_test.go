package hcomm_test

import (
	"fmt"
	"testing"

	"github.com/hcomm-dev/hcomm/hcomm"
)

func TestLaunched(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, ""},
		{map[string]string{"RANK": "0", "LOCAL_RANK": "0"}, ""}, // no world size: not a launch
		{map[string]string{"WORLD_SIZE": "4"}, "WORLD_SIZE"},    // half-set: InitFromEnv says what is missing
		{map[string]string{"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE"},
		{map[string]string{"SLURM_NTASKS": "8"}, "SLURM_NTASKS"},
		{map[string]string{"SLURM_NTASKS": "8", "WORLD_SIZE": "2"}, "WORLD_SIZE"}, // torchrun inside an allocation
	} {
		v, ok := hcomm.Launched(func(k string) string { return tc.env[k] })
		if v != tc.want || ok != (tc.want != "") {
			t.Errorf("Launched(%v) = %q, %v; want %q", tc.env, v, ok, tc.want)
		}
	}
	t.Setenv("WORLD_SIZE", "")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "")
	t.Setenv("SLURM_NTASKS", "3")
	if v, ok := hcomm.Launched(nil); v != "SLURM_NTASKS" || !ok {
		t.Errorf("Launched(nil) under SLURM_NTASKS=3: %q, %v", v, ok)
	}
}

func ExampleLaunched() {
	env := map[string]string{"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"} // as mpirun sets them
	if v, ok := hcomm.Launched(func(k string) string { return env[k] }); ok {
		fmt.Println("one rank of a launch:", v, "is set; join with InitFromEnv")
	} else {
		fmt.Println("started alone: run the ranks with InitAll")
	}
	// Output: one rank of a launch: OMPI_COMM_WORLD_SIZE is set; join with InitFromEnv
}
