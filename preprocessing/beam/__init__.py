"""The Apache Beam pipelines: conversion engine (dead letters, progress, publish), CT and image pipelines."""
