package main

import "testing"

func TestSampleRuns(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
