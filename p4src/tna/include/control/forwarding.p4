/* Forwarding (TNA): the shared control (p4src/shared/control/forwarding.p4). */
#ifndef _KVCAST_TNA_FORWARDING_P4_
#define _KVCAST_TNA_FORWARDING_P4_

#include "tna/include/arch.p4"
#include "shared/control/forwarding.p4"

#endif  // _KVCAST_TNA_FORWARDING_P4_
