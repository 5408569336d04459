/* PoolOwner (v1model): the shared control (p4src/shared/control/pool_owner.p4). */
#ifndef _KVCAST_POOL_OWNER_P4_
#define _KVCAST_POOL_OWNER_P4_

#include "v1model/include/arch.p4"
#include "shared/control/pool_owner.p4"

#endif  // _KVCAST_POOL_OWNER_P4_
