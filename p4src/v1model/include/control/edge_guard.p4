/* EdgeGuard (v1model): the shared control (p4src/shared/control/edge_guard.p4). */
#ifndef _KVCAST_EDGE_GUARD_P4_
#define _KVCAST_EDGE_GUARD_P4_

#include "v1model/include/arch.p4"
#include "shared/control/edge_guard.p4"

#endif  // _KVCAST_EDGE_GUARD_P4_
