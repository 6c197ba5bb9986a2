/* SPDX-License-Identifier: GPL-3.0-or-later */
/* The lab's pod sandbox process: no registry is reachable here, so the sandbox image the real containerd
 * runs for every pod is this static binary in an OCI image built locally (gpuharden_lab.realnode).  It
 * sleeps until a signal asks it to stop, which is all a sandbox's first process has to do. */
#include <signal.h>
#include <unistd.h>

static void stop(int signum)
{
    (void)signum;
    _exit(0);
}

int main(void)
{
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;)
        pause();
}
