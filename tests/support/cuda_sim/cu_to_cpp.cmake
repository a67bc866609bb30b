# Rewrites a kernels/*.cu file into C++ for cuda_sim (cmake -P, with IN and
# OUT): the launch syntax becomes a call into the simulator, dynamic shared
# memory becomes a pointer to the block's buffer, and the simulator's device
# header comes first. #line keeps errors and __FILE__ on the .cu file.
file(READ "${IN}" text)
string(REGEX REPLACE "<<<" " | ::triad_sim::Config(::triad_sim::Site{__FILE__, __LINE__}, " text "${text}")
string(REGEX REPLACE "__CUDA_ARCH__" "TRIAD_SIM_CUDA_ARCH" text "${text}")
string(REGEX REPLACE ">>>[ \t\r\n]*\\(" ")(" text "${text}")
set(_type "(unsigned char|[A-Za-z_][A-Za-z0-9_]*)")
set(_name "([A-Za-z_][A-Za-z0-9_]*)")
string(REGEX REPLACE "extern __shared__ __align__\\(([0-9]+)\\) ${_type} ${_name}\\[\\];"
       "\\2* \\3 = ::triad_sim::dynamic_shared<\\2, \\1>();" text "${text}")
string(REGEX REPLACE "extern __shared__ ${_type} ${_name}\\[\\];"
       "\\1* \\2 = ::triad_sim::dynamic_shared<\\1>();" text "${text}")
# __launch_bounds__(n): the kernel checks its block has at most n threads
# (a larger launch fails on a GPU).
string(REGEX REPLACE "__launch_bounds__\\(([^)]*)\\)([^{]*)\\{"
       "\\2{ ::triad_sim::check_launch_bounds(\\1);" text "${text}")
# Static shared arrays (one or two per declaration) are filled with NaN the
# first time a block reaches them, as dynamic shared memory is.
set(_dim "\\[([^]]+)\\]")
string(REGEX REPLACE "__shared__ ([A-Za-z_][A-Za-z0-9_]*) ${_name}${_dim}, ${_name}${_dim};"
       "static thread_local \\1 \\2[\\3], \\4[\\5]; ::triad_sim::fresh_shared(\\2, sizeof(\\2)); ::triad_sim::fresh_shared(\\4, sizeof(\\4));"
       text "${text}")
string(REGEX REPLACE "__shared__ ([A-Za-z_][A-Za-z0-9_]*) ${_name}${_dim};"
       "static thread_local \\1 \\2[\\3]; ::triad_sim::fresh_shared(\\2, sizeof(\\2));"
       text "${text}")
if(text MATCHES "<<<|>>>|__shared__|__launch_bounds__")
  message(FATAL_ERROR "cu_to_cpp: ${IN} has a launch or shared declaration this script cannot rewrite")
endif()
file(WRITE "${OUT}.tmp" "#include \"cuda_sim/device.h\"\n#line 1 \"${IN}\"\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
