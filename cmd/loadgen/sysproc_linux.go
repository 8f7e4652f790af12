package main

import "syscall"

// sysProcAttr makes the kernel signal the server if loadgen dies without
// running its clean-up (e.g. SIGKILL), so no benchmark server is left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
