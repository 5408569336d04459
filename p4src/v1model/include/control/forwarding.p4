/* Forwarding (v1model): the shared control (p4src/shared/control/forwarding.p4). */
#ifndef _KVCAST_FORWARDING_P4_
#define _KVCAST_FORWARDING_P4_

#include "v1model/include/arch.p4"
#include "shared/control/forwarding.p4"

#endif  // _KVCAST_FORWARDING_P4_
