# psm.m4 — find an installed psm from a third-party plugin's configure.ac.
#
# PSM_CHECK([MINIMUM-VERSION], [ACTION-IF-FOUND], [ACTION-IF-NOT-FOUND])
#
# Asks pkg-config for psm (at least MINIMUM-VERSION, if given) and sets and
# substitutes:
#   PSM_CFLAGS, PSM_LIBS   compiler and linker flags for a plugin
#   PSM_PLUGIN_LDFLAGS     libtool flags that make a loadable plugin module
#                          (-module -avoid-version -no-undefined -shared)
#   PSM_RUN                the psm-run of that installation (tests run
#                          pipelines with it)
#   PSM_ABI                its plugin ABI, MAJOR.MINOR
#   PSM_PLUGINDIR          the plugin folder of that installation
#   psmplugindir           where "make install" puts this project's plugins:
#                          ${libdir}/psm/plugins, which is PSM_PLUGINDIR when
#                          both projects share a prefix (elsewhere, add it to
#                          PSM_PLUGIN_PATH); --with-psm-plugindir=DIR sets it.
# Without psm: ACTION-IF-NOT-FOUND, by default an error saying what to do.
# An installation outside pkg-config's and aclocal's default folders needs
# PKG_CONFIG_PATH=PREFIX/lib/pkgconfig and ACLOCAL_PATH=PREFIX/share/aclocal.
#
# serial 1

AC_DEFUN([PSM_CHECK],
[AC_REQUIRE([PKG_PROG_PKG_CONFIG])dnl
m4_ifval([$1], [psm_check_req="psm >= $1"], [psm_check_req="psm"])
PKG_CHECK_MODULES([PSM], [$psm_check_req], [psm_check_found=yes], [psm_check_found=no])
AS_IF([test "x$psm_check_found" = xyes], [
  PSM_PLUGINDIR=`$PKG_CONFIG --variable=plugindir psm`
  PSM_RUN=`$PKG_CONFIG --variable=psm_run psm`
  PSM_ABI=`$PKG_CONFIG --variable=abi psm`
  PSM_PLUGIN_LDFLAGS="-module -avoid-version -no-undefined -shared"
  AC_ARG_WITH([psm-plugindir],
    [AS_HELP_STRING([--with-psm-plugindir=DIR],
                    [install plugins in DIR @<:@LIBDIR/psm/plugins@:>@])],
    [psmplugindir=$withval], [psmplugindir='${libdir}/psm/plugins'])
  AC_MSG_CHECKING([psm's plugin ABI])
  AC_MSG_RESULT([$PSM_ABI (psm-run: $PSM_RUN; its plugins: $PSM_PLUGINDIR)])
  AC_SUBST([PSM_PLUGINDIR])
  AC_SUBST([PSM_RUN])
  AC_SUBST([PSM_ABI])
  AC_SUBST([PSM_PLUGIN_LDFLAGS])
  AC_SUBST([psmplugindir])
  $2
], [
  m4_default([$3], [AC_MSG_ERROR([psm not found ($PSM_PKG_ERRORS).
Install psm, or set PKG_CONFIG_PATH to PREFIX/lib/pkgconfig of the psm you installed.])])
])
])
