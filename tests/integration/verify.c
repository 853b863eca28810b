/* SPDX-License-Identifier: MIT */
/*
 * verify.c - the integration tests check results with the same code as
 * rmsnormctl's selftest and bench (client/ctl/rmsnormctl_verify.c), compiled
 * into this suite so that both always agree on what "correct" means.
 */
#include "../../client/ctl/rmsnormctl_verify.c"
