/* EdgeGuard (TNA): the shared control (p4src/shared/control/edge_guard.p4). */
#ifndef _KVCAST_TNA_EDGE_GUARD_P4_
#define _KVCAST_TNA_EDGE_GUARD_P4_

#include "tna/include/arch.p4"
#include "shared/control/edge_guard.p4"

#endif  // _KVCAST_TNA_EDGE_GUARD_P4_
