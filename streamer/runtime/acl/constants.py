"""ACL constants: pyACL exports none, so streamer defines the numbers it uses.

Every value is copied from a C header; the pyACL documentation pages give different,
self-contradictory numbers for some enums (e.g. the malloc policy), and the headers win
(reference/pyacl.md §1.4 and §4).

Sources:
    RT ``include/external/acl/acl_rt.h`` (run mode, malloc policy, memcpy kind, callbacks),
    RT ``include/external/acl/acl_tdt_queue.h`` (queue attributes),
    GE ``inc/external/acl/acl_mdl.h`` (``ACL_DYNAMIC_TENSOR_NAME``),
    RT ``include/external/acl/acl_base.h`` (``aclDataType``),
    RT ``include/external/acl/acl_base_rt.h`` (1xxxxx/2xxxxx/5xxxxx ACL error codes),
    RT ``include/external/acl/error_codes/rt_error_codes.h`` (1070xx/2070xx/5070xx/5078xx
    runtime codes), GE ``inc/external/ge/ge_error_codes.h`` (145xxx/545xxx model executor codes).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "ACL_DYNAMIC_AIPP_NAME",
    "ACL_DYNAMIC_TENSOR_NAME",
    "AclCode",
    "AippInputFormat",
    "ACL_FORMAT_ND",
    "ACL_UNKNOWN_RANK",
    "DTYPES",
    "QUEUE_DEPTH_DEFAULT",
    "QUEUE_DEPTH_MIN",
    "QUEUE_NAME_MAX_BYTES",
    "TDT_USER_DATA_MAX_BYTES",
    "CallbackBlock",
    "DataType",
    "MallocPolicy",
    "MemcpyKind",
    "QueueAttr",
    "RunMode",
]


class RunMode(enum.IntEnum):
    """``aclrtRunMode``: where the application runs (``acl.rt.get_run_mode``)."""

    DEVICE = 0
    """``ACL_DEVICE``: the app runs on the device's CPU; host memory is device memory."""
    HOST = 1
    """``ACL_HOST``: the app runs on a host; device memory is reached only by memcpy."""


class MallocPolicy(enum.IntEnum):
    """``aclrtMemMallocPolicy`` for ``acl.rt.malloc``: one value, never OR-ed."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2
    HUGE_FIRST_P2P = 3
    HUGE_ONLY_P2P = 4
    NORMAL_ONLY_P2P = 5
    HUGE1G_ONLY = 6
    HUGE1G_ONLY_P2P = 7
    TYPE_LOW_BAND_WIDTH = 0x100
    TYPE_HIGH_BAND_WIDTH = 0x1000
    ACCESS_USER_SPACE_READONLY = 0x100000


class MemcpyKind(enum.IntEnum):
    """``aclrtMemcpyKind`` for ``acl.rt.memcpy`` (reserved in current runtimes, which infer
    the direction from the addresses; samples still pass one chosen from the run mode)."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4
    HOST_TO_BUF_TO_DEVICE = 5
    INNER_DEVICE_TO_DEVICE = 6
    INTER_DEVICE_TO_DEVICE = 7


class CallbackBlock(enum.IntEnum):
    """``aclrtCallbackBlockType`` for ``acl.rt.launch_callback``."""

    NO_BLOCK = 0
    BLOCK = 1
    """Later tasks of the stream wait until the callback has returned."""


class QueueAttr(enum.IntEnum):
    """``acltdtQueueAttrType`` for ``acltdtSetQueueAttr``."""

    NAME_PTR = 0
    """``param`` is the address of a ``char*``; ``len == sizeof(char*)``."""
    DEPTH_UINT32 = 1
    """``param`` is the address of a ``uint32``; ``len == 4``."""


class DataType(enum.IntEnum):
    """``aclDataType`` values returned by ``acl.mdl.get_input_data_type`` (the subset with a
    numpy equivalent)."""

    FLOAT = 0
    FLOAT16 = 1
    INT8 = 2
    INT32 = 3
    UINT8 = 4
    INT16 = 6
    UINT16 = 7
    UINT32 = 8
    INT64 = 9
    UINT64 = 10
    DOUBLE = 11
    BOOL = 12


DTYPES: dict[DataType, np.dtype] = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT32: np.dtype(np.int32),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT16: np.dtype(np.int16),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.BOOL: np.dtype(np.bool_),
}
"""``aclDataType`` → numpy dtype of the tensor elements."""

ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
"""The extra model input ATC adds for dynamic batch / image size / dims; its index comes from
``acl.mdl.get_input_index_by_name`` and ``set_dynamic_batch_size`` writes the gear into it."""

ACL_DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"
"""The extra model input ATC adds for dynamic AIPP (``aipp_mode: dynamic``); its index comes from
``acl.mdl.get_input_index_by_name`` and ``acl.mdl.set_input_aipp`` writes the AIPP parameters
into it (RT ``python/docs/zh/api_ref/ge/function-set_input_aipp.md``)."""


class AippInputFormat(enum.IntEnum):
    """``aclAippInputFormat`` for ``acl.mdl.set_aipp_input_format`` (RT
    ``python/docs/zh/api_ref/ge/aclAippInputFormat.md``)."""

    YUV420SP_U8 = 1
    XRGB8888_U8 = 2
    RGB888_U8 = 3
    """Interleaved 8-bit pixels, three channels (HWC)."""
    YUV400_U8 = 4
    NC1HWC0DI_FP16 = 5
    NC1HWC0DI_S8 = 6
    ARGB8888_U8 = 7
    YUYV_U8 = 8
    YUV422SP_U8 = 9
    AYUV444_U8 = 10
    RAW10 = 11
    RAW12 = 12
    RAW16 = 13
    RAW24 = 14


ACL_UNKNOWN_RANK = 0xFFFF_FFFF_FFFF_FFFE
"""What ``acl.get_tensor_desc_num_dims`` returns when the rank is unknown (dynamic shape,
reserved scenario): a ``size_t`` -2 (RT ``python/docs/zh/api_ref/ge/
function-get_tensor_desc_dim_range.md``)."""

ACL_FORMAT_ND = 2
"""``aclFormat`` ``ACL_FORMAT_ND``: a plain N-dimensional tensor (RT ``include/external/acl/
acl_base.h``)."""

QUEUE_DEPTH_DEFAULT = 8
"""Depth of a tdt queue created without a depth attribute (RT ``queue.cpp``)."""

QUEUE_DEPTH_MIN = 2
"""``RT_MQ_DEPTH_MIN``: the smallest depth ``acltdtCreateQueue`` accepts."""

QUEUE_NAME_MAX_BYTES = 128
"""Longest queue name, including the terminating NUL (RT ``queue.cpp``)."""

TDT_USER_DATA_MAX_BYTES = 96
"""Largest ``userData`` of ``acltdtEnqueueData`` (RT ``acl_tdt_queue.h``)."""


class AclCode(enum.IntEnum):
    """``aclError`` values streamer names; the enum name is the C macro without ``ACL_``."""

    SUCCESS = 0
    ERROR_INVALID_PARAM = 100000
    ERROR_UNINITIALIZE = 100001
    ERROR_REPEAT_INITIALIZE = 100002
    ERROR_INVALID_MODEL_ID = 100011
    ERROR_MODEL_INPUT_NOT_MATCH = 100017
    ERROR_MODEL_OUTPUT_NOT_MATCH = 100018
    ERROR_MODEL_NOT_DYNAMIC = 100019
    ERROR_OP_TYPE_NOT_MATCH = 100020
    ERROR_OP_INPUT_NOT_MATCH = 100021
    ERROR_OP_OUTPUT_NOT_MATCH = 100022
    ERROR_OP_ATTR_NOT_MATCH = 100023
    ERROR_OP_NOT_FOUND = 100024
    ERROR_INVALID_QUEUE_ID = 100032
    ERROR_REPEAT_SUBSCRIBE = 100033
    ERROR_STREAM_NOT_SUBSCRIBE = 100034
    ERROR_THREAD_NOT_SUBSCRIBE = 100035
    ERROR_WAIT_CALLBACK_TIMEOUT = 100036
    ERROR_REPEAT_FINALIZE = 100037
    ERROR_RT_PARAM_INVALID = 107000
    ERROR_RT_INVALID_DEVICEID = 107001
    ERROR_RT_CONTEXT_NULL = 107002
    ERROR_RT_ADDR_UNALIGNED = 107008
    ERROR_RT_STREAM_SUBSCRIBE = 107011
    ERROR_RT_THREAD_SUBSCRIBE = 107012
    ERROR_RT_STREAM_NO_CB_REG = 107015
    ERROR_RT_WAIT_TIMEOUT = 107019
    ERROR_RT_TASK_TIMEOUT = 107020
    ERROR_GE_PARAM_INVALID = 145000
    ERROR_GE_EXEC_NOT_INIT = 145001
    ERROR_GE_EXEC_MODEL_PATH_INVALID = 145002
    ERROR_GE_EXEC_MODEL_ID_INVALID = 145003
    ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID = 145006
    ERROR_GE_EXEC_MODEL_ADDR_INVALID = 145007
    ERROR_GE_EXEC_MODEL_QUEUE_ID_INVALID = 145008
    ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID = 145011
    ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
    ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
    ERROR_GE_AIPP_NOT_EXIST = 145015
    ERROR_BAD_ALLOC = 200000
    ERROR_API_NOT_SUPPORT = 200001
    ERROR_INVALID_DEVICE = 200002
    ERROR_MEMORY_ADDRESS_UNALIGNED = 200003
    ERROR_FEATURE_UNSUPPORTED = 200006
    ERROR_RT_FEATURE_NOT_SUPPORT = 207000
    ERROR_RT_MEMORY_ALLOCATION = 207001
    ERROR_RT_QUEUE_EMPTY = 207013
    ERROR_RT_QUEUE_FULL = 207014
    ERROR_RT_TIMEOUT = 207020
    ERROR_INTERNAL_ERROR = 500000
    ERROR_FAILURE = 500001
    ERROR_GE_FAILURE = 500002
    ERROR_RT_FAILURE = 500003
    ERROR_RT_REPORT_TIMEOUT = 507012
    ERROR_RT_AICORE_EXCEPTION = 507015
    ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
    ERROR_RT_DRV_INTERNAL_ERROR = 507899
    ERROR_GE_INTERNAL_ERROR = 545000
    ERROR_GE_LOAD_MODEL = 545001
