/* psm.h — everything a plugin author needs. */
#ifndef PSM_H
#define PSM_H
#include "psm-error.h"
#include "psm-tensor.h"
#include "psm-ops.h"
#include "psm-rng.h"
#include "psm-params.h"
#include "psm-config.h"
#include "psm-plugin.h"
#include "psm-batch.h"
#include "psm-component.h"
#include "psm-encoder.h"
#include "psm-decoder.h"
#include "psm-head.h"
#include "psm-task.h"
#include "psm-metric.h"
#include "psm-checkpoint.h"
#include "psm-vocab.h"
#include "psm-examples.h"
#include <stdio.h>
#endif
