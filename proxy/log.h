// Forwarding header while callers move to common/log.h (the lead removes it at merge).
#pragma once

#include "common/log.h"
